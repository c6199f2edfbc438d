"""Kubeflow Pipelines delivery: what the components call, and compile, local run, upload and schedule.

The components in :mod:`gagar.components` (``<stage>/component.py``) are thin: their bodies
call :mod:`gagar.pipeline.store_stages`, which moves files between the artifact store and the stage
functions of :mod:`gagar.stages`. :mod:`gagar.pipeline.build` compiles the pipelines of
:mod:`gagar.pipelines`, :mod:`gagar.pipeline.local` runs them through ``kfp.local``,
:mod:`gagar.pipeline.client` uploads and schedules them.
"""

__all__: list[str] = []
