"""What the chapters share, so that no chapter imports another: at the bottom, the checkers a
config declares its fields with (`fields`), checks of a config against its model's shape
(`checks`), the models a run holds (`loading`) and its results stores (`stores`); above them the
shape of a chapter (`base`); then the book's KV head ranking and the profiles' shared settings (`shared`),
the roles heads play (`roles`), the minimal model (`minimal`), head zeroing's screen
(`head_screen`, which masking reads too), the distilled student and its teacher (`distilled`).
Layered bottom to top in that order (tests/test_layers.py)."""
