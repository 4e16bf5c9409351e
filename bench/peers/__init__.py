"""Peer drivers for bench/workqueue.py; see bench/peers/common.py for the interface."""
