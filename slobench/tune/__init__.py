"""`slobench tune`: one capacity search per server configuration, ranked by capacity per GPU.

`configs` expands a command template and its parameters into configurations, `server_proc` runs one
server in its own process group, `search` runs `slobench capacity` against it as a child process,
`result` keeps tune.json and prints the table, `loop` drives them.
"""
