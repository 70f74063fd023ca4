"""One module per chapter of the book: its configuration, its run, and the verdicts on the
paper's claims computed from the run's numbers. A chapter imports no other chapter: what several
share is in `helpers.protocol` (the shape of a chapter, `helpers.protocol.base`; its stores, `helpers.protocol.stores`)."""
