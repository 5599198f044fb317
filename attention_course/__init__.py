"""Attention by hand: the reference library of attention-course."""
