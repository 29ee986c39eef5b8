"""Kernel sources (the dialect headers and one .cu file per op family), installed as package data."""
