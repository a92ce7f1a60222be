"""The outbox's job kinds (one handler module each: `title`, `recount`) and the worker that runs them
(`worker.py`). The queue itself, and the registry the apps add kinds to, is `conversations.outbox`: it sits low,
so a turn queues its work without importing the handlers that read turns."""
