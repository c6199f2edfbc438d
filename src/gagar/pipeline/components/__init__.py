"""One Kubeflow Pipelines component per stage; each folder holds component.py and a README."""
