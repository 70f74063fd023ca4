"""What the chapters share, so that no chapter imports another: the shape of a chapter and its
results stores (`base`), the book's KV head ranking and the profiles' shared settings (`shared`),
the roles heads play (`roles`), the minimal model (`minimal`), head zeroing's screen
(`head_screen`, which masking reads too), the distilled student and its teacher (`distilled`).
Layered bottom to top in that order (tests/test_layers.py)."""
