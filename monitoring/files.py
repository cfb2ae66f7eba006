"""Old home of the atomic writers, now in `globaldl.files`; re-exported for code still using it."""

from globaldl.files import write_bytes_atomically, write_text_atomically

__all__ = ["write_bytes_atomically", "write_text_atomically"]
