"""Moving in-flight samples between engines: drain, ship (in process, or as tickets whose
bytes go engine to engine through the transfer layer), resume; never losing a sample."""
