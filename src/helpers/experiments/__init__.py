"""One module per chapter of the book: its configuration, its run, and the verdicts on the
paper's claims computed from the run's numbers (see `helpers.experiments.base`)."""
