"""Taking a step from a rollout controller as the trainer does."""


async def take_step(svc, wait_s: float = 30.0):
    """Every micro-batch of the running step, the last one included, and then the step's
    metrics (end_step): (micro-batches, metrics)."""
    batches = []
    while not batches or not batches[-1].last:
        mb = await svc.next_microbatch(wait_s)
        if mb is not None:
            batches.append(mb)
    return batches, await svc.end_step()
