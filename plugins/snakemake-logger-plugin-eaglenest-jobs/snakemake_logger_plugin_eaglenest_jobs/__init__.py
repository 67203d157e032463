"""`--logger eaglenest-jobs`: Snakemake's job events as JSON lines (see eaglenest.job_events)."""

from eaglenest.job_events import JobEventsHandler as LogHandler
from eaglenest.job_events import JobEventsSettings as LogHandlerSettings

__all__ = ["LogHandler", "LogHandlerSettings"]
