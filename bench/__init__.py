"""geco's benchmarks: ``bench/run`` runs them all; one runs as
``python -m bench.<script>`` from the repo root."""
