"""Small helpers shared across keras_mvit2."""
