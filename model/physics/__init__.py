"""Stage 2, physics: the served model's numbers (``shape``), what memory holds (``memory``),
the seconds of every physical term on the silicon (``terms``) and a query's rows as those terms
(``features``)."""
