"""Environments of other libraries behind rlboost's Environment interface, named in
environment.name like a user's class (each library is imported only when named)."""
