"""cobatch as a Ray Serve application: N engine replicas behind one ingress running the same
Starlette app as `cobatch serve`, with prefix-aware routing between them.

    messages.py        what crosses Ray between the ingress and a replica (all picklable)
    replica.py         the engine deployment: one Engine per replica, streaming its requests
    remote_engine.py   the ingress's engine: the app's engine surface over a DeploymentHandle
    replica_stats.py   per-replica snapshots and their cluster-wide sum
    views.py           /health with every replica, Prometheus families with a replica label
    ingress.py         the ingress deployment mounting server.app's app
    routing.py         Ray Serve request router configurations (prefix-aware, round-robin, p2c)
    deploy.py          building the Serve application, and `cobatch serve --replicas N`

Nothing here is imported by `cobatch serve` without --replicas, and this package's __init__
imports no ray.
"""
