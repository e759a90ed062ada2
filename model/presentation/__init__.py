"""Stage 6, presentation: a decision as the contract's answer: reasons (``reasons``), the
launch command (``launch``), the ``Recommendation`` (``answer``) and deployment files
(``deploy``)."""
