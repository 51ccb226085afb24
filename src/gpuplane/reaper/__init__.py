"""Idle reaper: frees accelerators held by interactive sessions that stopped using them."""
