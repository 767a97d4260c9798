import { defineConfig } from 'vite';
import { svelte } from '@sveltejs/vite-plugin-svelte';

// The desktop app's front end: built into ui/dist, which the Tauri shell embeds.
export default defineConfig({
  plugins: [svelte()],
  clearScreen: false,
  build: { outDir: 'dist', emptyOutDir: true, target: 'es2022' },
  resolve: process.env.VITEST ? { conditions: ['browser'] } : undefined,
  test: { environment: 'jsdom', globals: true, include: ['src/**/*.test.ts'] },
});
