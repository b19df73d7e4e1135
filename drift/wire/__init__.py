"""Wire format shared by every DRIFT component: tensor frames, typed messages, errors.

Knows nothing about models, sockets or the swarm; only bytes <-> typed values.
"""
