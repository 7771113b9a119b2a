"""What a question to the recorder can come to short of an answer; the HTTP surfaces map
them to their statuses (404, 400, 503) and envelopes."""


class NotFound(LookupError):
    """Nothing known by that name (a node, a workload, a device, a cluster)."""


class BadRequest(ValueError):
    """A question that cannot be answered as asked (a bad parameter, a range too wide)."""


class Unavailable(RuntimeError):
    """What the answer needs is down or not there yet (a cluster not watched)."""


class Conflict(ValueError):
    """What a write would make exists already (a rule's or a channel's name)."""


class Forbidden(PermissionError):
    """A write the service does not make (a shipped template, a shipped rule)."""
