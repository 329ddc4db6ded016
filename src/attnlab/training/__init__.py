"""attnlab.training"""
