"""engine-advisor's pure-computation core: workloads, KV arithmetic, hardware, the cost model,
the recommender and artifacts. Imports nothing from calibration/, service/ or sim/.

The cost model's matrices are small (at most a grid's rows x 26 features): a BLAS thread pool
only adds synchronisation, and on a busy machine its spinning threads made a 80,000-row
prediction ten times slower. The process's BLAS is limited to one thread on import."""

from threadpoolctl import threadpool_limits

threadpool_limits(limits=1, user_api="blas")
