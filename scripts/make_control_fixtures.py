"""Reference transitions of gymnasium's classic-control environments for tests/control.rs.

Random rollouts of Pendulum-v1 (torques drawn beyond the ±2 bound, to exercise the clip) and
CartPole-v1 (the two discrete actions, which are Ember's continuous a = ±1), recording the
unwrapped state before each step, the action, the next state, the reward and termination.

    python -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install gymnasium==1.4.0 numpy
    /tmp/refvenv/bin/python scripts/make_control_fixtures.py

writes tests/fixtures/control/gymnasium_transitions.json.
"""

import json
import pathlib

import gymnasium as gym
import numpy as np


def step(env, action, stored_action):
    """One step of `env`, recorded with the state before it."""
    state = [float(v) for v in env.unwrapped.state]
    obs, r, term, trunc, _ = env.step(action)
    row = {
        "state": state,
        "action": [stored_action],
        "next": [float(v) for v in env.unwrapped.state],
        "obs": [float(v) for v in obs],
        "reward": float(r),
        "terminated": bool(term),
    }
    return row, term or trunc


def pendulum(episodes=3, seed=0):
    env = gym.make("Pendulum-v1")
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(episodes):
        env.reset(seed=seed + e)
        for _ in range(200):
            u = float(rng.uniform(-3.0, 3.0))
            row, done = step(env, np.array([u], dtype=np.float32), float(np.float32(u)))
            rows.append(row)
            if done:
                break
    return rows


def cart_pole(episodes=20, seed=100):
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(episodes):
        env.reset(seed=seed + e)
        while True:
            a = int(rng.integers(0, 2))
            row, done = step(env, a, 1.0 if a == 1 else -1.0)
            rows.append(row)
            if done:
                break
    return rows


def main():
    out = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/control"
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "gymnasium": gym.__version__,
        "pendulum": pendulum(),
        "cart_pole": cart_pole(),
    }
    (out / "gymnasium_transitions.json").write_text(json.dumps(data))
    print({k: len(v) for k, v in data.items() if isinstance(v, list)})


if __name__ == "__main__":
    main()
