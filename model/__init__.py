"""engine-advisor's pure-computation core: workloads, KV arithmetic, hardware, the cost model,
the recommender and artifacts. Imports nothing from calibration/, service/ or sim/."""
