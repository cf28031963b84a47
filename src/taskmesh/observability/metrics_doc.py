"""Print ``docs/metrics.md`` from the metrics registry.

``python -m taskmesh.observability.metrics_doc > docs/metrics.md``
"""

from taskmesh.observability.metrics import Metrics

if __name__ == "__main__":
    print(Metrics().markdown(), end="")
