"""Tools from Model Context Protocol servers (issue 32, X3): which servers there are (`servers`), one process's
connections to them (`connection`), and their tools as Arbor's registry sees them (`tools`)."""
