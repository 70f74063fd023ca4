"""What the package asks of a tokenizer, for tests that make their own vocabulary."""


class Tokenizer:
    """A subclass's `encode` (text -> ids), called as a Hugging Face tokenizer is on a batch of
    texts (`packing.encode_pairs`)."""

    pad_token_id = 0

    def encode(self, s: str) -> list[int]:
        raise NotImplementedError

    def __call__(self, texts: list[str]) -> dict:
        return {"input_ids": [self.encode(t) for t in texts]}
