"""Roles: what each worker computes (actor, critic, reference, reward model, rollout), written once against BaseEngine / BaseRollout."""
