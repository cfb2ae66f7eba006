"""globaldl."""
