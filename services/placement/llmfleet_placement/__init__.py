"""Placement service: elected leader turns the cluster config into desired state in etcd."""
