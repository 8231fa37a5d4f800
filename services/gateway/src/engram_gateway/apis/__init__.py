"""One adapter per API a client speaks to the gateway's chat turn pipeline
(:mod:`engram_gateway.turn_pipeline`): how to read the turn, where recalled memory
goes, how to find the reply's text whole and streamed, and the API's error shape."""
