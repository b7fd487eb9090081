"""Starting Spark's classic session from a command's main thread without giving up its signals."""

from __future__ import annotations

import threading


def start_spark_aside(master: str | None) -> None:
    """Spark's classic session, started on a thread of its own while the main thread waits
    (the pull then finds it started). On the main thread pyspark's context installs a SIGINT
    handler of its own (the command's handler would no longer see Ctrl-C), and a signal landing amid
    Spark's imports left modules half imported (``partially initialized module 'pandas'``); a
    wait is where a signal interrupts the main thread cleanly."""
    done = threading.Event()
    failed: list[BaseException] = []

    def start() -> None:
        try:
            from spark_backend.spark.session import spark_session

            spark_session(master)
        except BaseException as e:
            failed.append(e)
        finally:
            done.set()

    threading.Thread(target=start, name="spark-start", daemon=True).start()
    done.wait()
    if failed:
        raise failed[0]
