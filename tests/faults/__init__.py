"""The fault suite: real drain processes, a real receiver and PostgreSQL, injected faults."""
