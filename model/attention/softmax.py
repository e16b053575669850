"""Deprecated path, kept for one release: moved to ``model.attention.deepspeed.softmax`` (DeepSpeed's
API has its own package). Code ported to this path keeps importing, with a DeprecationWarning naming the new one."""

from model.attention import warn_moved

warn_moved(__name__)
from model.attention.deepspeed.softmax import Softmax  # noqa: E402,F401
