// Mounts the window's view: an approval dialog (#/approval/<id>) or the main window.
import { mount } from 'svelte';
import App from './App.svelte';
import './app.css';

mount(App, { target: document.getElementById('app')! });
