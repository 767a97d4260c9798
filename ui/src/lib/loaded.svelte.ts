// One view's data from a command and the message of what went wrong: the load-and-error logic
// every view shares, written once. An action's error outlives the reload that follows it.
import { messageOf } from './ipc';

export class Loaded<T> {
  value = $state<T | null>(null);
  error = $state<string | null>(null);
  readonly #fetch: () => Promise<T>;

  constructor(fetch: () => Promise<T>) {
    this.#fetch = fetch;
  }

  /** Fetches again: on failure the last value stays, with the reason. */
  load = async (): Promise<void> => {
    try {
      this.value = await this.#fetch();
      this.error = null;
    } catch (e) {
      this.error = messageOf(e);
    }
  };

  /** Runs one of the view's actions (add, remove, restart), then loads again; a failure is
   *  shown after the reload, so the list's success does not hide it, and `onFailure` runs at
   *  once (a form clears its secret). True if it succeeded. */
  act = async (action: () => Promise<unknown>, onFailure?: () => void): Promise<boolean> => {
    let failure: string | null = null;
    try {
      await action();
    } catch (e) {
      failure = messageOf(e);
      // Before the reload: a secret typed into a form leaves it at once, whatever the reload does.
      onFailure?.();
    }
    await this.load();
    if (failure !== null) this.error = failure;
    return failure === null;
  };
}
