"""What the recorder's periodic jobs (accounting/jobs.py, alerts/jobs.py, ...), each run by
core/runner and listed in service/schedule.py, may meet."""

from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.recorder.prom import PromError

# what a job may meet and the runner logs in one line: the database or Prometheus down
FAILURES = (SQLAlchemyError, PromError)
