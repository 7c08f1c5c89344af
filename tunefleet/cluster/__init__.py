"""The cluster: Kubernetes work pools and their Job templates, and deployments on a Prefect server."""
