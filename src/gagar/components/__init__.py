"""One Kubeflow Pipelines component per stage: ``<stage>/component.py`` (one call into
:mod:`gagar.pipeline.store_stages`), its README and ``metadata.yaml``. The folders live in the
checkout's top-level ``components/``; the wheel maps them here."""

from gagar._checkout import checkout_folder

__path__ += checkout_folder("components")
