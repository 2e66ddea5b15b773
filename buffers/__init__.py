"""Replay side: the experience pool, replay shards and the sharded replay client."""
