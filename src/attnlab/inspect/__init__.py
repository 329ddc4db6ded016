"""attnlab.inspect"""
