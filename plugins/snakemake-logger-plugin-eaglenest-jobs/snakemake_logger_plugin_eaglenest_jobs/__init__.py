"""`--logger eaglenest-jobs`: Snakemake's job events as JSON lines (see eaglenest.pipeline.job_events)."""

from eaglenest.pipeline.job_events import JobEventsHandler as LogHandler
from eaglenest.pipeline.job_events import JobEventsSettings as LogHandlerSettings

__all__ = ["LogHandler", "LogHandlerSettings"]
