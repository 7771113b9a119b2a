"""The recorder's periodic jobs, each run by core/runner (listed in RecorderApp.start())."""

from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.recorder.prom import PromError

# what a job may meet and the runner logs in one line: the database or Prometheus down
FAILURES = (SQLAlchemyError, PromError)
