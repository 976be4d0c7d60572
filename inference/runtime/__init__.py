"""The serving runtime: the bounded job queue, one stream pipe per request, the one worker
thread that owns the model, and the process-wide service."""
