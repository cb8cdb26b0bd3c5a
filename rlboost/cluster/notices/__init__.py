"""Preemption notices: one record (base.Notice) from a cloud's metadata service (aws, gcp,
azure) or a node's shutdown hook (hook: `rlboost notice`), heard on each preemptible node
by a light actor (agent) and handed to the run's driver.
"""
