"""The bus plumbing: how every specstream process connects to Kafka, talks to it, and keeps its topics and rights.

``connection`` (TLS/SASL client options), ``clients`` (producers, consumers, admin, topic creation, the wire
codec), ``acls`` and ``permissions`` (each service's least privileges, checked at start), ``compacted_table``
(a compacted topic read as a table), ``announcements`` (the services topic read whole), ``topic_watch`` (topics
gone under a running process), ``reply_routes`` (which reply topics a consumer may write), ``dead_letter_topic``
and ``reply_topics_gc`` (reading and cleaning topics). It imports nothing of streams/ but the configuration.
"""
