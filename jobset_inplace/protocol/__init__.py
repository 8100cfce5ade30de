"""What the agent and the controller say to each other (this project's API types): the agent's
typed report with its one codec and ordering rule (:mod:`.report`) and the report channel's
request envelope (:mod:`.envelope`). Standard library only."""
