"""The scoring of the book's extractive tasks, as lm-eval scores SWDE (and its other recall tasks
from the same suite, FDA and SQuAD completion): right when the answer appears in the generation,
ignoring case. The task YAMLs name it with `process_results: !function utils.contains`."""

from lm_eval.tasks.swde.task import contains_score


def contains(doc: dict, results: list[str]) -> dict[str, int]:
    return {"contains": contains_score(results[0], [doc["answer"]])}
