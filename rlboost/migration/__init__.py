"""Token-level migration of in-flight samples between engines: the records and codecs
(RequestState, KV pages, packed batches), the handoff ticket, and both ends of a handoff
over the transfer layer (sender, receiver, and the endpoint an instance owns). No engine
is imported here: an engine is anything with export_states and import_states."""
