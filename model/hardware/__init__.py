"""Stage 1, hardware: the GPU catalogue (``gpus``), measured profiles and kernel tables
(``profiles``), and ``silicon``: what one call of each operation costs on one GPU type."""
