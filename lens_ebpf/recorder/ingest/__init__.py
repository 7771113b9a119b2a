"""What comes in to the recorder: who may post (admission), and the node agents' events
(the collector protocol, stored)."""
