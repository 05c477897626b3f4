"""The Spark session and the progress lines every job prints.

No master is set in code: ``SparkSession.builder`` without ``.master()`` gives ``local[*]`` when
run with plain ``python``, and whatever ``spark-submit --master`` or the ``MASTER`` environment
variable says otherwise. ``--master URL`` on the command line is the one explicit override.

Spark's Python workers run the driver's own interpreter (:func:`python_for_workers`), so a
virtualenv's packages are there, unless ``PYSPARK_PYTHON`` (or ``spark.pyspark.python``) says
otherwise.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

APP_NAME = "plugbroker-analyze"


def python_for_workers(conf: Mapping[str, str] | None = None) -> str:
    """Point Spark's Python workers at this interpreter (``sys.executable``) unless
    ``PYSPARK_PYTHON`` or ``spark.pyspark.python`` already names one; return the one they run.

    Spark otherwise starts the ``python3`` on the PATH, which in a virtualenv is not the one that
    has the broker's dependencies (lxml, pyarrow) installed.
    """
    chosen = (conf or {}).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    if chosen:
        return chosen
    os.environ["PYSPARK_PYTHON"] = sys.executable
    return sys.executable


def get_spark(
    master: str | None = None, conf: Mapping[str, str] | None = None, app_name: str = APP_NAME
) -> Any:
    """The active SparkSession, or a new one (``master`` only when given)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None and not conf:
        return active
    python_for_workers(conf)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    # Spark's own stage progress bar on a terminal; plain step lines (Progress) otherwise
    builder = builder.config(
        "spark.ui.showConsoleProgress", "true" if sys.stderr.isatty() else "false"
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if _may_choose(conf, "JavaOptions"):
        # the driver JVM this call starts: the throughput collector, not G1, for a batch job
        # (10 to 20% off a report on 2 cores; in local mode the driver runs every task)
        builder = builder.config("spark.driver.defaultJavaOptions", THROUGHPUT_GC)
    pools = None
    if _may_choose(conf, "spark.scheduler."):
        # fair scheduling with a lead pool, so that run_together can put the longest chain
        # of work ahead of the rest (see run_together)
        pools = _lead_pool_file()
        builder = builder.config("spark.scheduler.mode", "FAIR")
        builder = builder.config("spark.scheduler.allocation.file", pools)
    try:
        spark = builder.getOrCreate()
    finally:
        if pools is not None:
            os.unlink(pools)  # read when the SparkContext starts
    spark.sparkContext.setLogLevel("WARN")
    local_shuffle_partitions(spark)
    return spark


#: the driver JVM's collector when this module starts the JVM (see :func:`get_spark`)
THROUGHPUT_GC = "-XX:+UseParallelGC"


def _may_choose(conf: Mapping[str, str] | None, marker: str) -> bool:
    """Whether :func:`get_spark` may set the settings whose keys contain ``marker``: only when
    it starts the SparkContext (none yet, not under ``spark-submit``) and nobody else chose
    any, in ``conf``, ``PYSPARK_SUBMIT_ARGS`` or ``spark-defaults.conf`` (two garbage
    collectors, for one, would stop the JVM)."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None or os.environ.get("SPARK_ENV_LOADED"):
        return False
    if any(marker in k for k in (conf or {})):
        return False
    if marker in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return False
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(
        os.environ.get("SPARK_HOME", ""), "conf"
    )
    defaults = os.path.join(conf_dir, "spark-defaults.conf")
    try:
        with open(defaults, encoding="utf-8") as f:
            return marker not in f.read()
    except OSError:
        return True


#: the scheduler pool whose jobs get free cores before any other's (see :func:`run_together`)
LEAD_POOL = "plugbroker-lead"


def _lead_pool_file() -> str:
    """A fair-scheduler allocation file with :data:`LEAD_POOL` (a temporary file; the caller
    removes it). A pool under its minimum share is served first, and the lead pool's minimum
    is more tasks than any machine runs at once, so its pending tasks always go first; the
    other jobs (the default pool) take the cores it leaves free."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="plugbroker-pools-", suffix=".xml")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(
            '<?xml version="1.0"?>\n<allocations>\n'
            f'  <pool name="{LEAD_POOL}">\n'
            "    <schedulingMode>FIFO</schedulingMode>\n"
            "    <weight>1000</weight>\n"
            "    <minShare>100000</minShare>\n"
            "  </pool>\n</allocations>\n"
        )
    return path


def local_shuffle_partitions(spark: Any) -> None:
    """In local mode, shuffle into twice as many partitions as there are cores, unless
    ``spark.sql.shuffle.partitions`` was set: Spark's default of 200 is sized for a cluster,
    and on a small machine the map side then writes 200 blocks per task for every shuffle
    (about 10% of a report's time on 2 cores)."""
    sc = spark.sparkContext
    if not str(sc.master).startswith("local"):
        return
    if sc.getConf().contains("spark.sql.shuffle.partitions"):
        return
    spark.conf.set("spark.sql.shuffle.partitions", str(max(2, 2 * sc.defaultParallelism)))


#: the byte limit of an Arrow batch sent to Python workers; Spark's default is 64 MB
ARROW_BATCH_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"


@contextmanager
def arrow_batches_by_rows(spark: Any) -> Iterator[None]:
    """While the block runs, Spark cuts the Arrow batches it sends to Python workers by row
    count only (``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 by default).

    With a byte limit set (64 MB by default), Spark measures the batch it is building after
    every row, at a cost that grows with the number of columns: for the backtest's narrow rows
    (about a hundred bytes, so 10,000 of them stay far below the limit) that check took more of
    the JVM's time than writing the rows. A limit someone chose is kept.
    """
    before = spark.conf.get(ARROW_BATCH_BYTES)
    if before.lower() not in ("64m", "64mb", "67108864", "67108864b"):
        yield
        return
    spark.conf.set(ARROW_BATCH_BYTES, str(2**31 - 1))  # Spark's "no limit": the check is skipped
    try:
        yield
    finally:
        spark.conf.set(ARROW_BATCH_BYTES, before)


def run_together(*actions: Callable[[], Any], lead: bool = False) -> list[Any]:
    """Run independent Spark actions at once, each from its own thread; return their results in
    order (the first error is raised once all have ended).

    Spark schedules the tasks of concurrent jobs side by side: a core left idle by one job's
    last tasks takes the next job's, and one job's planning on the driver overlaps another's
    tasks. The threads are PySpark's ``InheritableThread``, so each job keeps the caller's job
    description and local properties.

    ``lead``: the first action is the longest chain of work, to be run ahead of the others:
    its jobs go to :data:`LEAD_POOL`, whose tasks get the free cores first, when the session
    has that pool (one :func:`get_spark` started); the others fill the cores it leaves idle.
    Without it, Spark serves the jobs in the order they were submitted, and the longest chain
    (whose query takes the longest to plan) would come last and finish last.
    """
    from pyspark import InheritableThread, SparkContext

    results: list[Any] = [None] * len(actions)
    errors: list[BaseException] = []
    sc = SparkContext._active_spark_context
    pool = None
    if lead and sc is not None and sc._jsc.sc().getPoolForName(LEAD_POOL).isDefined():
        pool = LEAD_POOL

    def run(i: int, action: Callable[[], Any]) -> None:
        if i == 0 and pool is not None and sc is not None:
            sc.setLocalProperty("spark.scheduler.pool", pool)
        try:
            results[i] = action()
        except BaseException as exc:  # re-raised on the calling thread below
            errors.append(exc)

    threads = [
        InheritableThread(target=run, args=(i, a), name=f"spark-action-{i}")
        for i, a in enumerate(actions)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


class Progress:
    """``[report 3/9] per-consumer figures (4.1 s so far)`` lines on stderr.

    Each :meth:`step` also becomes the Spark job description, so the Spark UI shows the same
    names when a cluster runs the job.
    """

    def __init__(
        self,
        job: str,
        total: int,
        *,
        spark: Any = None,
        quiet: bool = False,
        out: IO[str] | None = None,
    ) -> None:
        self.job = job
        self.total = total
        self.spark = spark
        self.quiet = quiet
        self.out = out if out is not None else sys.stderr
        self.n = 0
        self.started = time.monotonic()

    def step(self, what: str) -> None:
        self.n += 1
        if self.spark is not None:
            self.spark.sparkContext.setJobDescription(f"{self.job}: {what}")
        self.say(f"[{self.job} {self.n}/{self.total}] {what}")

    def say(self, text: str) -> None:
        if not self.quiet:
            elapsed = time.monotonic() - self.started
            print(f"{text} ({elapsed:.1f} s)", file=self.out, flush=True)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


class Scratch:
    """Where intermediate results are written once and read back (a context manager).

    Spark's in-memory cache is slow for these wide intermediate tables (caching 3 million rows
    took longer than computing them twice); writing them as Parquet and reading them back is
    several times faster. In local mode the directory is a temporary one on the driver; on a
    cluster give a shared directory (``--scratch hdfs://...``), or none to recompute instead.
    """

    def __init__(self, spark: Any, path: str | None = None) -> None:
        import tempfile

        self.spark = spark
        self._own = False
        if path is None and str(spark.sparkContext.master).startswith("local"):
            path = tempfile.mkdtemp(prefix="plugbroker-analyze-")
            self._own = True
        self.path = path
        self._n = 0
        self._lock = threading.Lock()

    def materialize(self, df: Any, name: str) -> Any:
        """``df`` computed once and read back from Parquet (or ``df`` itself without a path)."""
        if self.path is None:
            return df
        with self._lock:  # materialize may be called from several threads (run_together)
            self._n += 1
            where = f"{self.path.rstrip('/')}/{self._n:02d}-{name}"
        df.write.mode("overwrite").parquet(where)
        # with the schema it was written with: Spark then starts no job to infer it
        return self.spark.read.schema(df.schema).parquet(where)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._own and self.path is not None:
            import shutil

            shutil.rmtree(self.path, ignore_errors=True)
