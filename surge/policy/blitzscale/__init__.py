"""BlitzScale's decisions: live scaling with zigzag schedules (§4-§5) and prefill/decode
disaggregation (§5.2, §6).
"""
