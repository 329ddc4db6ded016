"""attnlab.viz"""
