"""Parts of task synthesis from real libraries; the entry point is :mod:`gagar.tasks.synthesize`."""
