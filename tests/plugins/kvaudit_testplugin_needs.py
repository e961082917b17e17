"""A plugin module whose own import of a missing dependency fails."""

import kvaudit_no_such_dependency  # noqa: F401
